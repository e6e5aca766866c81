// Behavioural models of the ECP5 primitives that the design instantiates itself, so that its
// Verilog as elaborated for an ECP5 runs under Icarus Verilog. They model the configurations
// the design uses, after Lattice's ECP5 sysDSP and clocking documentation, and refuse others.

// A global clock buffer: CLKO follows CLKI while CE is high.
module DCCA (input CLKI, input CE, output CLKO);
    assign CLKO = CLKI & CE;
endmodule

// An 18 x 18 multiplier. A and B (with SIGNEDA and SIGNEDB) pass through the input registers
// when REG_INPUTx_CLK names a clock: they move on a rising edge of CLK0 while CE0 is high and
// clear on one with RST0 high (RESETMODE "SYNC"). The 36-bit product leaves unregistered. Only
// CLK0, CE0 and RST0 are modelled.
module MULT18X18D (
    input A0, A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12, A13, A14, A15, A16, A17,
    input B0, B1, B2, B3, B4, B5, B6, B7, B8, B9, B10, B11, B12, B13, B14, B15, B16, B17,
    input C0, C1, C2, C3, C4, C5, C6, C7, C8, C9, C10, C11, C12, C13, C14, C15, C16, C17,
    input SIGNEDA, SIGNEDB, SOURCEA, SOURCEB,
    input CLK0, CLK1, CLK2, CLK3, CE0, CE1, CE2, CE3, RST0, RST1, RST2, RST3,
    output P0, P1, P2, P3, P4, P5, P6, P7, P8, P9, P10, P11, P12, P13, P14, P15, P16, P17,
    output P18, P19, P20, P21, P22, P23, P24, P25, P26, P27, P28, P29, P30, P31, P32, P33, P34, P35
);
    parameter REG_INPUTA_CLK = "NONE";
    parameter REG_INPUTA_CE = "CE0";
    parameter REG_INPUTA_RST = "RST0";
    parameter REG_INPUTB_CLK = "NONE";
    parameter REG_INPUTB_CE = "CE0";
    parameter REG_INPUTB_RST = "RST0";
    parameter REG_INPUTC_CLK = "NONE";
    parameter REG_PIPELINE_CLK = "NONE";
    parameter REG_OUTPUT_CLK = "NONE";
    parameter RESETMODE = "SYNC";
    parameter SOURCEB_MODE = "B_SHIFT";
    parameter MULT_BYPASS = "DISABLED";
    parameter GSR = "ENABLED";

    initial begin
        if ((REG_INPUTA_CLK != "NONE" && (REG_INPUTA_CLK != "CLK0" || REG_INPUTA_CE != "CE0" || REG_INPUTA_RST != "RST0")) ||
            (REG_INPUTB_CLK != "NONE" && (REG_INPUTB_CLK != "CLK0" || REG_INPUTB_CE != "CE0" || REG_INPUTB_RST != "RST0")) ||
            REG_OUTPUT_CLK != "NONE" || REG_INPUTC_CLK != "NONE" || REG_PIPELINE_CLK != "NONE" || RESETMODE != "SYNC" || MULT_BYPASS != "DISABLED")
            $fatal(1, "MULT18X18D %m: a configuration this model does not cover");
    end

    wire [17:0] a_in = {A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0};
    wire [17:0] b_in = {B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0};
    reg [17:0] a_reg = 0, b_reg = 0;
    reg signed_a_reg = 0, signed_b_reg = 0;
    always @(posedge CLK0) begin
        if (RST0) begin
            a_reg <= 0; signed_a_reg <= 0; b_reg <= 0; signed_b_reg <= 0;
        end else if (CE0) begin
            a_reg <= a_in; signed_a_reg <= SIGNEDA; b_reg <= b_in; signed_b_reg <= SIGNEDB;
        end
    end
    wire [17:0] a = REG_INPUTA_CLK == "NONE" ? a_in : a_reg;
    wire [17:0] b = REG_INPUTB_CLK == "NONE" ? b_in : b_reg;
    wire signed_a = REG_INPUTA_CLK == "NONE" ? SIGNEDA : signed_a_reg;
    wire signed_b = REG_INPUTB_CLK == "NONE" ? SIGNEDB : signed_b_reg;
    // Each operand extended to 36 bits by its own signedness, the product's low 36 bits.
    wire [35:0] wide_a = {{18{signed_a & a[17]}}, a};
    wire [35:0] wide_b = {{18{signed_b & b[17]}}, b};
    wire [35:0] p = wide_a * wide_b;
    assign {P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20, P19, P18,
            P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3, P2, P1, P0} = p;
endmodule
